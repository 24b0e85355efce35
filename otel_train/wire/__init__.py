"""The record schema both sides share (internal): the training process writes records in it,
the exporter process reads them, and neither imports the other."""
