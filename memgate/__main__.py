from memgate.cli import entry

entry()
