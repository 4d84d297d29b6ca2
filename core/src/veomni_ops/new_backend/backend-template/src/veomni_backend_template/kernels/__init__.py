"""The backend's kernels (heavy: imports torch). Imported only when a config selects one."""
