"""NumPy side of the book: the math of attention, one module per chapter,
reused by later ones.

core        softmax, the log-sum-exp merge of partial softmaxes, masks, scaled
            dot-product, self/cross, multi-head (chapter 1)
checks      the argument checks every module uses (TypeError/ValueError by name)
positions   sinusoidal positions and RoPE (chapter 1)
memory      simulated HBM/SRAM traffic, every load and store counted, closed forms
            (chapters 1-4)
flash       online softmax, tiled forward (FA1 and FA2 loop orders), backward
            (chapter 2)
hard        argmax, sampled (Gumbel-max), top-k, straight-through, REINFORCE
            (chapter 3)
deformable  reference grid, offsets, bilinear sampling, DAT, multi-scale (MSDA)
            (chapter 4)
decode      KV cache, split-KV (FlashDecoding), paged cache, GQA (chapter 5)
ring        sharding layouts, blockwise attention, the ring schedule (chapter 6)
masks       mask and score mods of positions, block masks, attention under them with
            sinks (chapter 7)
plots       the book's figures and its one palette
explorers   the book's explorers, one call each: ipywidgets in Jupyter and Colab,
            static twins drawn in the browser on the built site
"""
