"""The one error a bad configuration raises."""


class ConfigError(ValueError):
    """A configuration value is wrong; the message is one line that says how to fix it."""
