"""NumPy side of the book: the math of attention, one module per chapter.

core       softmax, masks, scaled dot-product, self/cross, multi-head
memory     simulated HBM/SRAM traffic with closed forms beside each algorithm
plots      the book's figures and its one palette
"""
