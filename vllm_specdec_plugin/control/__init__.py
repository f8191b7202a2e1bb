"""The controller, pure Python: ``policy`` (the one decision), ``cost`` (the step's cost
fits), ``acceptance`` (measured α), ``estimators`` (what they are built from)."""
