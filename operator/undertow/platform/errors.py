"""The platform's one error type, apart so that the control clients and the platform
interface can both raise it without importing each other."""


class PlatformError(RuntimeError):
    """A platform operation failed or did not take effect in time."""
