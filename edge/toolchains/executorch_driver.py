"""A torch.export program -> ExecuTorch ``.pte`` with the XNNPack delegate, inside the ``executorch`` toolchain
(executorch 1.5.1 + the CPU torch), and the ``.pte`` run by ExecuTorch's own runtime on this host.

Run by :class:`edge.backends.executorch.convert.TorchToExecuTorch` as
``<toolchain>/venv/bin/python executorch_driver.py job.json``. It must not import ``edge``. Protocol: one JSON
object per line on the original stdout (``stage`` | ``result`` | ``error``); whatever torch and ExecuTorch print
goes to ``convert.log`` in the work directory. The run is offline (``edge.toolchains.offline_popen``).

Steps: ``torch.export.load`` (the user inputs name the model's inputs; they must be the job's) -> the program's
module on the parity samples (the reference: ``reference_outputs.npz``, outputs ``output_0``.. in return order)
-> ``to_edge_transform_and_lower(partitioner=[XnnpackPartitioner()])`` -> ``to_executorch()`` -> ``model.pte`` ->
what the delegate took and what it left to ExecuTorch's portable kernels (``get_delegation_info``: every op left,
counted, not the first) -> ``executorch.runtime`` loads the ``.pte`` and runs the same samples
(``runtime_outputs.npz``): ExecuTorch's x86 kernels on this host, the parity candidate.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

# the drivers' shared output plumbing, beside this file (python -I leaves the script's directory off the path)
sys.path.insert(0, str(Path(__file__).resolve().parent))

from driver_output import Events, redirect_output  # noqa: E402

EVENTS = Events()


emit = EVENTS.emit


stage = EVENTS.stage


class JobRefused(Exception):
    """The job cannot be done as asked (its kind and one line for the user)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def _flat(out: Any) -> list[Any]:
    import torch

    leaves, _ = torch.utils._pytree.tree_flatten(out)
    return [t for t in leaves if isinstance(t, torch.Tensor)]


def _load(job: dict[str, Any]) -> tuple[Any, list[str]]:
    """The ExportedProgram and its input names in the model's positional order (the job's inputs reordered)."""
    import torch

    try:
        ep = torch.export.load(job["torch"])
    except Exception as e:
        first = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
        raise JobRefused(
            "load",
            f"torch.export.load (torch {torch.__version__}) cannot read {Path(job['torch']).name} "
            f"({type(e).__name__}: {first})",
        ) from e
    names = [str(n) for n in ep.graph_signature.user_inputs]
    given = [t["name"] for t in job["inputs"]]
    if sorted(given) != sorted(names):
        raise JobRefused(
            "inputs", f"the model's inputs are {', '.join(names) or '(none)'}; --input-shape gave {', '.join(given)}"
        )
    return ep, names


def _run_all(fn: Any, samples: Any, names: list[str]) -> list[list[Any]]:
    """``fn`` on every sample (stacked per input name in ``samples``); each result's tensors as numpy arrays."""
    import numpy as np
    import torch

    count = len(samples[names[0]])
    outs = []
    for i in range(count):
        feeds = [torch.from_numpy(np.ascontiguousarray(samples[n][i], dtype=np.float32)) for n in names]
        outs.append([np.asarray(t.detach().numpy(), dtype=np.float32) for t in _flat(fn(feeds))])
    return outs


def _save(work: Path, name: str, outs: list[list[Any]]) -> str:
    import numpy as np

    stacked = {f"output_{j}": np.stack([o[j] for o in outs]) for j in range(len(outs[0]))}
    np.savez(work / name, **stacked)  # type: ignore[arg-type]
    return str(work / name)


def _delegation(edge_program: Any) -> dict[str, Any]:
    """What XNNPack took and every op it left to ExecuTorch's portable kernels, counted."""
    from executorch.devtools.backend_debug import get_delegation_info

    info = get_delegation_info(edge_program.exported_program().graph_module)
    left = {}
    for row in info.get_operator_delegation_dataframe().to_dict("records"):
        op, n = str(row.get("op_type")), int(row.get("occurrences_in_non_delegated_graphs") or 0)
        if n and op not in ("Total", "getitem", "alloc"):
            left[op] = n
    return {
        "delegated_subgraphs": int(info.num_delegated_subgraphs),
        "delegated_nodes": int(info.num_delegated_nodes),
        "non_delegated_nodes": int(info.num_non_delegated_nodes),
        "left_to_portable_kernels": dict(sorted(left.items())),
    }


def convert(job: dict[str, Any], work: Path) -> dict[str, Any]:
    import numpy as np
    import torch

    torch.set_grad_enabled(False)
    timings: dict[str, float] = {}
    t0 = time.time()
    stage("loading the torch.export program")
    ep, names = _load(job)
    samples = dict(np.load(job["samples"]))
    stage("running the PyTorch program on the parity samples (reference)")
    module = ep.module()
    reference = _run_all(lambda feeds: module(*feeds), samples, names)
    timings["reference_s"] = round(time.time() - t0, 2)

    t0 = time.time()
    stage("lowering to ExecuTorch with the XNNPack partitioner")
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    edge_program = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()])
    delegation = _delegation(edge_program)
    program = edge_program.to_executorch()
    pte = work / "model.pte"
    pte.write_bytes(program.buffer)
    timings["lower_s"] = round(time.time() - t0, 2)

    t0 = time.time()
    stage("running the .pte on ExecuTorch's runtime (this host's x86 kernels)")
    from executorch.runtime import Runtime

    runtime = Runtime.get()
    method = runtime.load_program(str(pte)).load_method("forward")
    meta = method.metadata
    got = _run_all(lambda feeds: method.execute(feeds), samples, names)
    timings["runtime_s"] = round(time.time() - t0, 2)
    from importlib.metadata import version

    return {
        "artifact": str(pte),
        "bytes": pte.stat().st_size,
        "input_names": names,
        "outputs": [{"name": f"output_{j}", "shape": list(a.shape)} for j, a in enumerate(reference[0])],
        "reference_outputs": _save(work, "reference_outputs.npz", reference),
        "runtime_outputs": _save(work, "runtime_outputs.npz", got),
        "pte_inputs": [list(meta.input_tensor_meta(i).sizes()) for i in range(meta.num_inputs())],
        "backends": list(runtime.backend_registry.registered_backend_names),
        "delegation": delegation,
        "timings": timings,
        "tool_versions": {"executorch": version("executorch"), "torch": torch.__version__, "numpy": np.__version__},
    }


def main() -> int:
    job = json.loads(Path(sys.argv[1]).read_text())
    work = Path(job["workdir"])
    EVENTS.stream, log = redirect_output(work)  # noqa: F841 - the log kept open for the run
    try:
        emit("result", **convert(job, work))
        return 0
    except JobRefused as e:
        emit("error", kind=e.kind, message=str(e)[:1500])
        return 1
    except Exception as e:  # noqa: BLE001 - reported to the parent as an event
        traceback.print_exc()
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        emit("error", kind="conversion", message=f"{type(e).__name__}: {(lines[0] if lines else '')[:600]}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
