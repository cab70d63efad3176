"""Convert a legacy ``.pt``/``.bin`` state dict to safetensors, without executing code.

    python scripts/convert_checkpoint.py checkpoints/discriminator/best/best.pt stage1/discriminator
    python scripts/convert_checkpoint.py old.bin new.safetensors

The input is read with ``torch.load(map_location="cpu", weights_only=True)``: a pickle that
needs code execution is refused. The output is ``OUT`` if it ends in ``.safetensors``, else
``OUT/model.safetensors``; either is accepted by ``init.generator`` / ``init.discriminator``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trainer.contract.errors import UserError  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Convert a .pt/.bin state dict to safetensors.")
    p.add_argument("source", type=Path)
    p.add_argument("target", type=Path)
    args = p.parse_args(argv)
    from safetensors.torch import save_file

    from trainer.state.weights import WEIGHTS_NAME, read_legacy_state_dict

    try:
        if not args.source.is_file():
            raise UserError(f"{args.source}: no such file")
        state = read_legacy_state_dict(args.source)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    target = args.target if args.target.suffix == ".safetensors" else args.target / WEIGHTS_NAME
    target.parent.mkdir(parents=True, exist_ok=True)
    # safetensors stores no aliasing: tied or shared tensors become separate copies.
    save_file({name: tensor.detach().clone().contiguous() for name, tensor in state.items()}, str(target))
    print(f"wrote {target}: {len(state)} tensors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
