"""`tensorfold-serve`: an OpenAI-compatible HTTP server (Starlette on uvicorn) over the lane-round engine."""
