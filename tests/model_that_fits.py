"""The runbooks' GPT models cut to 0.8 GB checkpoints, for tests of the job layer and the attempt
loop: the train task refuses a run whose checkpoints its filesystem cannot hold (pretrain/checkpoint_room.py;
94 to 107 GB at 6.7 to 7.5 B parameters, more than this machine's disk has free), and the model
is not what those tests are about."""

MODEL_THAT_FITS = ["model.num_layers=2", "model.hidden_size=512", "model.num_attention_heads=8",
                   "model.num_kv_heads=8", "model.ffn_hidden_size=2048"]
