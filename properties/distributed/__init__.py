"""The distributed families: the process pool, vocabulary-parallel linear+CE and tensor/sequence-parallel FP8 linear."""
