"""The controller: what a step verifies, decided once (pure Python, no vLLM).

- ``policy``: the one decision (``decide``), its probes and host-time term, and the
  hint the scheduler applies it with;
- ``cost``: the step's cost fits, in seconds and in plain steps;
- ``acceptance``: measured acceptance per request, scope and n-gram match;
- ``estimators``: the three estimators everything above is built from.
"""
