"""``python -m eddyline.cli``, as the ``eddyline`` script."""

from eddyline.cli import main

main()
