"""Writing: Ray Data's ``Datasink`` (``datasink``), each write task's file writers (``writers``), the
all-or-nothing commit (``commit``, no Ray) and the files it lists and deletes (``dataset_files``)."""
