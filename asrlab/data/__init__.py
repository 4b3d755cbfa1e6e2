"""The data pipeline: sources (shards, raw lists, Kaldi, NeMo, URLs), the loader with its plan and state,
features, the tokenizer, the index and the embedded corpus's synthesizer."""
