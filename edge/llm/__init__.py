"""LLMs on the edge through llama.cpp: GGUF reading, quantization with a quality gate, runner, benchmark."""
