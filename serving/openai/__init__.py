"""The OpenAI chat-completions protocol: ``protocol`` (wire models), ``service``
(`ChatCompletionService`), ``router`` (routes). Import from the modules."""
