"""Errors the plugin raises for bad input. Each message names the fix."""


class SpecDecConfigError(ValueError):
    """The plugin's configuration is invalid (bad key, value, path or preset)."""


class DraftCompatibilityError(ValueError):
    """The draft model cannot serve this target (vocab, EOS, tokenizer, context)."""
