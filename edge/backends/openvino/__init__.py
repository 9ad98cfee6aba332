"""The openvino backend: format (bundle contents), convert (build host), run (device)."""
