"""LLM backends behind one interface: vLLM servers over HTTP, in-process vLLM, a simulated model."""
