"""The model endpoint: the chat client, replicas, the response cache, structured output,
the tool-call parser and request deadlines."""
