"""Schematics of the book: structures a reader would rather look at than read (drawn with matplotlib).

``base`` holds the drawing primitives every chapter shares (boxes, arrows, a matrix drawn as a grid
of cells with its blocks outlined); each chapter's diagrams live in ``chNN.py`` and are imported on
their own (``from lattn_core.schematics.ch03 import ...``). Nothing here computes the book's
mathematics: a schematic that shows numbers takes them from the references in :mod:`lattn_core`.
Imported on its own, like :mod:`lattn_core.notebook` (``import lattn_core`` does not load it).
"""
