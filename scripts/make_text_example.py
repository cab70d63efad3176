"""Write the offline real-text example: texts from the standard library's docstrings, a BPE
tokenizer trained on them, and a tiny untrained causal LM (see trainer/commands/text_example.py).

    python scripts/make_text_example.py outputs/text_example [--architecture gpt2|llama]
"""

from __future__ import annotations

import argparse

from trainer.commands.text_example import write_text_example


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", help="directory to write")
    p.add_argument("--architecture", default="gpt2", choices=["gpt2", "llama"])
    p.add_argument("--vocab-size", type=int, default=1000)
    args = p.parse_args()
    paths = write_text_example(args.out, args.architecture, args.vocab_size)
    for name, path in paths.items():
        print(f"{name}: {path}")


if __name__ == "__main__":
    main()
