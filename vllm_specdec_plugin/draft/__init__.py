"""The draft model: a Llama forward in plain torch over the plugin's paged KV cache."""
