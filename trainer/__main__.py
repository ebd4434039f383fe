"""Node programs: ``python -m trainer tokenize|convert|train|preflight|monitor ...``.

They read their arguments, write their outputs and a JSON record, and never import Prefect,
so they run the same by hand as under the pipeline.
"""

import sys


def main() -> int:
    commands = {"tokenize": "trainer.tokenize", "convert": "trainer.convert", "train": "trainer.train.main",
                "preflight": "trainer.preflight", "monitor": "trainer.monitor.main"}
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        print(f"usage: python -m trainer {{{','.join(commands)}}} ...", file=sys.stderr)
        return 2
    if sys.argv[1] == "train":
        # before the imports of torch and the model code, which a stop signal would otherwise end
        from trainer.train import stop_signals

        stop_signals.catch()
    import importlib

    return importlib.import_module(commands[sys.argv[1]]).main(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
