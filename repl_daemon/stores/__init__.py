"""The stores: ``memory`` (nothing kept), ``sqlite`` (the default), ``redis`` (shared).

``base`` states what every store must guarantee. A store raises only
``StoreFailed``; ``repl_daemon.daemon.open_store`` picks one for a config.
"""
