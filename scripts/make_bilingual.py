"""Entry point of tiered_memory/eval/bilingual.py, which writes the shipped quality set
(tiered_memory/eval/data/bilingual.jsonl) from its source, bilingual_source.json beside it."""

from tiered_memory.eval.bilingual import main

if __name__ == "__main__":
    raise SystemExit(main())
