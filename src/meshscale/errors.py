"""The one exception type meant for users: the CLI prints it as one line and exits with code 2."""


class MeshscaleError(Exception):
    """Bad input or an unusable environment, explained in one line (no traceback shown)."""


class TopologyError(MeshscaleError):
    """A system description that is malformed or inconsistent."""
