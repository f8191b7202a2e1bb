"""Errors the plugin raises for bad input. Each message names the fix."""


class SpecDecError(ValueError):
    """Base: a problem the user fixes (config, model pair, environment), not a bug.

    The plugin's ``vllm`` launcher prints these as one line and exits with status 2.
    """


class SpecDecConfigError(SpecDecError):
    """The plugin's configuration is invalid (bad key, value, path or preset)."""


class DraftCompatibilityError(SpecDecError):
    """The draft model cannot serve this target (vocab, EOS, tokenizer, context)."""


class UnsupportedFeatureError(SpecDecError):
    """A vLLM feature this plugin cannot serve exactly (refused at start-up)."""
