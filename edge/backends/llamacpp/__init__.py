"""The llamacpp backend: format (bundle contents), convert (build host), run (device)."""
