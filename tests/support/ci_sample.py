"""Tests outside CI's representative sample: each runs with ``pytest -m corpus_full`` (and in the benchmarks), not in
the README's test command, because a cheaper test in the default run covers the same layer.

CI's budget (the whole ``.ci/run`` in 20 minutes on an idle 2-core machine) was 42 minutes of pytest on the CI
machine on 2026-11-28 (1567 tests). Figures: seconds measured here on 2026-11-29 (AMD EPYC, AVX512-BF16, 2 vCPUs,
load 2-5 from other work) by ``pytest -p durlog`` (setup + call + teardown). Each entry says what keeps its layer in
the default run. ``tests/conftest.py`` marks them ``corpus_full`` at collection; ``tests/test_ci_sample.py`` fails on
an entry that names no test."""

from __future__ import annotations

#: node id -> (seconds measured, what covers the layer in the default run)
OUTSIDE_CI: dict[str, tuple[float, str]] = {
    # --- the executorch runner's contract needs the executorch toolchain (a torch.export program lowered to a .pte;
    # 1.5 GB, 60-105 s to install: not in .ci/run) and the runtime in the test's environment: the default run keeps
    # tests/backends/test_executorch.py's refusals, the runner's check and the interface's stamp. Measured with the
    # runtime (the toolchain's executorch and the built interface) on PYTHONPATH: 7 passed, 15.6 s (the bundle)
    "tests/backends/test_runner_contract.py::test_loads_and_reports_device_and_precision[executorch]": (
        15.6,
        "tests/backends/test_executorch.py (default: the runner's check; corpus_full: the runner on a real bundle)",
    ),
    "tests/backends/test_runner_contract.py::test_io_spec_matches_the_manifest[executorch]": (
        0.1,
        "tests/backends/test_executorch.py (default: the runner's check; corpus_full: the runner on a real bundle)",
    ),
    "tests/backends/test_runner_contract.py::test_infers_on_the_declared_io[executorch]": (
        0.1,
        "tests/backends/test_executorch.py (default: the runner's check; corpus_full: the runner on a real bundle)",
    ),
    "tests/backends/test_runner_contract.py::test_wrong_shape_is_refused_naming_input_and_expected_shape[executorch]": (
        0.1,
        "tests/backends/test_executorch.py (default: the runner's check; corpus_full: the runner on a real bundle)",
    ),
    "tests/backends/test_runner_contract.py::test_wrong_dtype_is_refused_naming_input_and_dtype[executorch]": (
        0.1,
        "tests/backends/test_executorch.py (default: the runner's check; corpus_full: the runner on a real bundle)",
    ),
    "tests/backends/test_runner_contract.py::test_missing_or_unknown_input_is_refused[executorch]": (
        0.1,
        "tests/backends/test_executorch.py (default: the runner's check; corpus_full: the runner on a real bundle)",
    ),
    "tests/backends/test_runner_contract.py::test_close_then_infer_is_refused[executorch]": (
        0.1,
        "tests/backends/test_executorch.py (default: the runner's check; corpus_full: the runner on a real bundle)",
    ),
    # --- emulated aarch64 (qemu-user): one convert check and the over-the-limit failure stay
    "tests/agent/test_agent_aarch64.py::test_the_agent_runs_on_emulated_aarch64": (
        103.6,
        "test_isa_aarch64::test_convert_checks_on_emulated_aarch64 runs the guest; the agent's protocol on x86",
    ),
    "tests/verify/test_isa_aarch64.py::test_verify_a_signed_bundle_signs_the_evidence_again": (
        14.7,
        "test_convert_checks_on_emulated_aarch64 (the guest), test_signing (re-signing)",
    ),
    "tests/verify/test_isa_aarch64.py::test_a_coral_bundle_is_checked_on_its_cpu_int8_path": (
        13.2,
        "test_convert_checks_on_emulated_aarch64",
    ),
    # --- examples and the main job: the README's quick start deploy stays (test_quickstart_deploy_on_defaults)
    "tests/cli/test_main_job.py::test_example_full_flow": (35.0, "test_quickstart_deploy_on_defaults, test_cli"),
    "tests/cli/test_main_job.py::test_example_video_demo": (12.6, "tests/video (the pipeline, the CLI's run)"),
    # --- LiteRT conversions: fp32 and int8 through onnx2tf stay, and the corpus sample's arm-xnnpack cases
    "tests/backends/test_litert_convert.py::test_cli_convert_then_bench": (26.9, "test_cli, test_bench_* on x86-cpu"),
    "tests/backends/test_litert_convert.py::test_arm_xnnpack_every_precision[int8-dynamic-f32 with int8 weights "
    "(dynamic range)]": (10.9, "test_arm_xnnpack_every_precision[int8-int8]"),
    "tests/backends/test_litert_convert.py::test_arm_xnnpack_every_precision[fp16-f32 (fp16 weights)]": (
        9.8,
        "test_arm_xnnpack_every_precision[fp32-f32]; the fp16 proxy tests",
    ),
    "tests/backends/test_litert_convert.py::test_an_op_onnx2tf_exits_on_is_named_with_its_reason": (
        10.9,
        "tests/toolchains/test_onnx2tf_failure.py (the reader on that run's log), test_ops_tflite_cannot_express_are_named",
    ),
    "tests/backends/test_litert_convert.py::test_coral_without_the_compiler": (
        14.1,
        "test_sources::test_full_integer_tflite_for_coral, test_edgetpu_finish",
    ),
    "tests/backends/test_edgetpu_finish.py::test_converting_where_the_compiler_is_gives_the_same_layout": (
        8.0,
        "test_finish_compiles_rehashes_and_the_runner_takes_it",
    ),
    "tests/backends/test_onnx2tf_mistranslations.py::test_without_the_rewrite_onnx2tf_diverges_at_the_slice": (
        16.3,
        "the rewrite's own unit tests and test_the_jax2tf_conv1d_classifier_converts_for_arm_xnnpack",
    ),
    "tests/tune/test_tune_batch.py::test_litert_trials_keep_parity_with_latest_features_and_batch": (
        11.8,
        "the tuner's onnxruntime trials (test_tune), LiteRTOptions' rule tests",
    ),
    "tests/graph/test_freeze.py::test_an_lstm_given_its_state_converts_for_litert": (
        9.1,
        "the other freeze tests (x86-cpu)",
    ),
    # --- torch->onnx: a TorchScript's int argument given its value stays ([rate.pt], and through the pipeline)
    "tests/backends/test_torch_onnx.py::test_freeze_input_gives_an_int_argument_its_value[rate.pt2]": (
        17.6,
        "test_freeze_input_gives_an_int_argument_its_value[rate.pt], test_torch_to_onnx_matches_the_reference[tiny.pt2]",
    ),
    # --- Core ML through torch: the TorchScript mlpackage stays
    "tests/backends/test_coreml_torch.py::test_torch_to_mlpackage[tiny.pt2-torch-exported-program]": (
        20.2,
        "test_torch_to_mlpackage[tiny.pt-torchscript]; test_torch_onnx reads .pt2",
    ),
    "tests/backends/test_coreml_torch.py::test_other_targets_take_torch_through_onnx[x86-cpu-fp32]": (
        20.1,
        "test_torch_onnx (torch -> ONNX on x86-cpu)",
    ),
    "tests/backends/test_coreml_torch.py::test_other_targets_take_torch_through_onnx[jetson-orin-fp16]": (
        10.6,
        "test_torch_onnx; test_tensorrt",
    ),
    "tests/backends/test_coreml_torch.py::test_other_targets_take_torch_through_onnx[intel-igpu-fp16]": (
        10.1,
        "test_torch_onnx; the OpenVINO tests",
    ),
    "tests/backends/test_coreml_torch.py::test_fp16_host_proxy_on_the_reference_inputs[tiny.pt2-the decomposed "
    "ExportedProgram]": (13.2, "test_fp16_host_proxy_on_the_reference_inputs[tiny.pt-the TorchScript module]"),
    # --- the store: the x86 gate and the ssh store's other tests stay
    "tests/store/test_deploy_device_class.py::test_arm_xnnpack_benchmarked_on_x86_does_not_gate": (
        16.1,
        "test_x86_cpu_benchmarked_here_gates",
    ),
    # --- the agent's rollout steps: applied, rolled back, refused, budget; the rest are variations
    "tests/agent/test_agent_rollout.py::test_a_verify_step_past_its_deadline_fails_with_timeout": (
        12.7,
        "test_bundle_over_budget_is_refused_by_the_smoke_test (a failed verify step)",
    ),
    "tests/agent/test_agent_rollout.py::test_agent_stopped_mid_apply_applies_the_retained_desired_state_at_the_next_start": (
        12.6,
        "test_store_crash (killed at every step), test_agent_hostile's restart case",
    ),
    "tests/agent/test_agent_rollout.py::test_app_source_watch_judges_the_applications_frames_and_the_app_follows_the_switch": (
        10.2,
        "test_app_that_stops_reporting_on_the_new_bundle_is_rolled_back",
    ),
    "tests/agent/test_agent_rollout.py::test_a_newer_desired_state_supersedes_a_stuck_apply": (
        8.9,
        "test_older_desired_version_after_a_newer_one_is_ignored",
    ),
    "tests/agent/test_agent_rollout.py::test_download_cut_midway_resumes_with_a_range_request": (
        8.0,
        "test_agent_hostile's partial-file and declared-size download tests",
    ),
    "tests/agent/test_agent_rollout.py::test_file_url_artifact_is_applied": (7.9, "test_good_bundle_is_applied_*"),
    "tests/agent/test_agent_rollout.py::test_a_stored_copy_that_is_not_the_desired_artifact_is_downloaded": (
        6.4,
        "test_corrupt_artifact_is_refused_before_install",
    ),
    "tests/agent/test_agent_rollout.py::test_agent_reloads_when_current_changes": (
        6.1,
        "test_rollback_to_the_previous_bundle_switches_locally_without_a_download",
    ),
    "tests/agent/test_agent_sources.py::test_lean_entry_point_runs_and_stops": (
        12.6,
        "test_agent_lean (the lean entry point's imports)",
    ),
    "tests/agent/test_agent_hostile.py::test_hostile_retained_desired_state_is_reported_failed_once[http://[::1/x]": (
        6.4,
        "the same test's other URLs",
    ),
    "tests/agent/test_agent_hostile.py::test_hostile_retained_desired_state_is_reported_failed_once"
    "[http://host:99999/b.tar]": (6.2, "the same test's other URLs"),
    # --- brokers: RabbitMQ's agent + collector path stays; its cluster fail-over is the broker's own behaviour
    "tests/mqtt/test_broker_rabbitmq.py::test_cluster_node_stopped_one_agent_fails_over_the_other_waits": (
        11.9,
        "test_agent_and_collector_through_rabbitmq_mqtt_3_1_1",
    ),
    "tests/backends/test_coreml.py::test_converter_returns_an_fp16_host_proxy": (
        7.8,
        "test_coreml_torch's fp16 host proxy, test_host_proxy_without_an_fp16_kernel_says_it_ran_fp32",
    ),
    "tests/store/test_ssh_deploy.py::test_ssh_recovers_a_killed_local_writer_exactly_as_local_does": (
        9.0,
        "test_store_crash (the local writer killed at every step), test_ship_verify_switch_and_rollback_over_ssh",
    ),
    # --- the collector killed mid-run: the light client's case stays, paho's is the same store path
    "tests/fleet/test_fleet_ingest.py::test_collector_killed_mid_batch_loses_nothing_and_stores_nothing_twice[paho]": (
        6.9,
        "the same test [lite]",
    ),
    "tests/fleet/test_fleet_scale.py::test_two_collectors_one_killed_mid_run_lose_nothing_and_store_nothing_twice"
    "[paho]": (6.6, "the same test [lite]"),
    # --- the tuner: one chunked study stays
    "tests/tune/test_tune.py::test_several_chunks_share_an_anchor": (
        6.7,
        "test_e2e_objective_runs_at_the_target_rate_*",
    ),
    # --- 2026-11-29, second session: the whole .ci/run took 19 min 44 s on an idle host (pytest 1115.6 s), too close
    # to 20 minutes; two corpus cases whose chain another case of the sample takes move out (idle-host seconds)
    "tests/pipeline/test_corpus.py::test_corpus_case[ppocr-det-intel-igpu-int8]": (
        11.6,
        "test_corpus_case[ppocr-cls-intel-igpu-int8] (the same chain and precision, 4.1 s), ppocr-det's x86-cpu fp32 case",
    ),
    "tests/pipeline/test_corpus.py::test_corpus_case[ppocr-cls-arm-xnnpack-fp32]": (
        14.6,
        "test_litert_convert's test_arm_xnnpack_every_precision[fp32-f32] and test_isa_aarch64's "
        "test_convert_checks_on_emulated_aarch64 (ONNX -> fp32 .tflite, with the emulated check)",
    ),
}
