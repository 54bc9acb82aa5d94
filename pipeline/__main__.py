from pipeline.front import entry

entry()
