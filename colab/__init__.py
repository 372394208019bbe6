"""The book on Colab: the setup cell every chapter starts with (``setup_cell.py``),
the Colab edition of each notebook page (``edition``, written under ``colab/``) and the
site's Colab launch button pointed at that edition (``launch``)."""
