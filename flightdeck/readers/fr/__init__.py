"""The flight-recorder dump reader: files as PyTorch writes them -> normalized `RankDump` records.

Formats are known here and nowhere else. Pickles are untrusted input (anyone who can write the
dump directory can write one): they are read with `decode.SafeUnpickler`, which builds only plain
data and refuses every global, so a hostile pickle cannot run code. Everything after this package
sees `flightdeck.records` types only.

One concern per module, each importing only those above it; import a name from the module that
defines it (this package re-exports nothing):

- `errors`: the `DumpError` tree, why a file is not a usable dump;
- `decode`: restricted unpickling (`SafeUnpickler`, `safe_loads`), `load_raw` (pickle or JSON ->
  the raw dump dict) and the per-file budget (`DumpBudget`, `check_budget`);
- `normalize`: one raw entry -> one `Entry` (`_entry`'s fast path, `_entry_slow`'s forgiving one);
- `columns`: the entries checked and normalized a column at a time (`EntryColumns`);
- `signatures`: the summary's cheapest read of a dump (`SignatureColumns`);
- `groups`: process groups from a dump's `pg_config` and `pg_status`;
- `parse`: a raw dump and its sidecar -> a `RankDump` (`parse_dump`, `parse_columns`,
  `parse_signatures`, `ring_extent`);
- `scan`: each entry's identity and progress without normalizing (`scan_entries`, `entry_rows`);
- `files`: dump files on disk (`read_regular`, `read_meta`, `load_dump_file`, `LoadedDump`,
  `read_dump_file`, `discover`);
- `merge`: several snapshots of one rank as one `RankDump`.
"""
