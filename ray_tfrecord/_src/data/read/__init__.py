"""Reading: paths -> files (``listing``, ``globs``, ``foreign``) -> byte ranges and read tasks
(``planning``) -> Arrow blocks (``read_tasks``), behind Ray Data's ``Datasource`` (``datasource``)."""
