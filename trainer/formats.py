"""The version of each node program's output bytes.

A stage's cache key holds its writer's version, never the git commit: a commit that leaves the
bytes alone (a README edit, a new test) must not invalidate terabytes of tokens or a converted
70B checkpoint. Bump a version by hand when its writer's bytes change; tests/test_formats.py
keeps a golden hash of a tiny output per version and fails, naming the constant, when the bytes
change under an unchanged version.
"""

TOKENIZE = 1  # trainer/tokenize.py: Megatron .bin/.idx (trainer/indexed_dataset.py), NxD Arrow (trainer/nxd_arrow.py)
CONVERT = 1  # trainer/convert.py: NxDT shards (torch.save or torch_xla's xser, trainer/xser.py)
