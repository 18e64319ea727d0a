"""The review: plan a job into chunks, review a chunk with the model, assemble and post once."""
