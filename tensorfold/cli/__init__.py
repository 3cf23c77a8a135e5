"""The command line: `tensorfold` (generate, make-tiny, contract, serve, bench) and `tensorfold-serve`. It sits on
top of everything; nothing in the package imports it."""
