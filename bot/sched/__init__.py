"""The scheduler: MLFQ decisions (pure) and the dispatcher that feeds LLM slots from the queue."""
