"""Shipped prompt set for engine tests: varied code and prose, short and long."""

CODE = [
    "def main(", "import os\nimport sys\n\n", "class Parser(object):\n    def __init__(self",
    "    for i in range(", "if __name__ == \"__main__\":\n", "from collections import ",
    "    def __repr__(self):\n        return ", "try:\n    import ", "        raise ValueError(",
    "# Copyright", "    @property\n    def name(self):\n", "def _get_default(key, default=None):\n",
    "        self.assertEqual(", "    with open(path, 'rb') as f:\n", "return [x for x in ",
    "\"\"\"Utilities for", "        if not isinstance(", "    except KeyError:\n        ",
    "lambda x: x", "    while True:\n        line = ",
]
PROSE = [
    "The quick brown fox", "Once upon a time", "This module provides", "Return a new",
    "Note that the", "In this case the function", "An error occurred while",
    "The following example shows how", "It is", "See also", "a", "\n\n\n",
]
PROMPTS = CODE + PROSE          # 32 prompts
assert len(PROMPTS) == 32
