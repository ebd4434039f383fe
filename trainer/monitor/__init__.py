"""``python -m trainer monitor``: the device sampler that runs beside the training ranks, one per node.

It reads the node's accelerators (NVML on NVIDIA GPUs, ``neuron-monitor`` on Trainium) or, on a
node without any, the CPU from /proc, every few seconds, and writes one ``{"kind": "device"}``
record per device and sample to its node's file beside the run's metrics stream, and to
TensorBoard. It is a process of its own, not a thread of a rank: it shares no interpreter lock
with training, and it keeps sampling while the ranks hang or crash, when device errors matter most.
"""
