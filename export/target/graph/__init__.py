"""Static-shape ONNX graphs for Llama-family models, written op by op with onnx.helper.

Why by hand and not torch.onnx: the graph is small and regular, and writing it directly gives
exact control over the ops each phase runs (the kernel path decides decode/verify parity) and one
shared weights file. PyTorch stays the reference: the exporter checks every graph against the
Hugging Face model.

Each model is declared once, as a ModelWriter: its weights (`_prepare`) and its graph (`build`),
written as calls on the flavour's layer ops (layer_ops.LayerOps; FLAVOURS below): the decoder here
(target and draft), each drafter's graph in its own module (export/drafters/<name>/graph.py). Every
flavour shares the weights and the I/O: portable (portable.py: standard ops, TensorRT takes
it) and lean (lean.py: ONNX Runtime's fused ops where they keep the rule, 26 nodes per layer
instead of 62); the linears are a strategy of their own (quant/linears.py).

The "delta" form of docs/design.md. One graph per model serves every phase: its token axis T is
symbolic, and the manifest lists the phase widths (prefill chunk P, decode 1, verify 2..k+1) the
runtime feeds it - each a static shape (a TensorRT optimization profile with min = opt = max).
One graph means one ORT session per model, so weights are prepacked once and held once:
  inputs   input_ids [1, T] int64, positions [1, T] int64, past_len [1] int64,
           past_key_<l>, past_value_<l> [S, Hkv*D] for every layer l: the first S slots of the
           cache, S a context bucket >= past_len + T (rows from past_len on are not read)
  outputs  logits [1, T, V] float32, new_kv [L, 2, T, Hkv*D], hidden [1, T, H]
The KV buffer is sequence-major ([S, Hkv*D] per layer) so that the first S rows of the runtime's
[S_max, Hkv*D] buffer are one contiguous slice: attention cost follows the context bucket S, not
max_len, with no copy. Attention over that layout avoids transposing the cache by folding the
heads into one 2-D Gemm (portable.PortableOps.attention).

Modules: builder.py (GraphOptions, GraphBuilder), store.py (where the arrays go: WeightStore, SpillStore,
the weights file), writer.py (ModelWriter, the decoder: LlamaGraphWriter), layer_ops.py (the ops every
flavour shares), portable.py, lean.py (+ lean_prologue.py), streaming.py (the writer of a checkpoint
read one tensor at a time), op_probe.py (what this CPU's ONNX Runtime keeps row for row alike).
"""
