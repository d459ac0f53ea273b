"""Run by mkdocs-gen-files at build time (mkdocs.yml): writes the pages generated from the code and the records
(:mod:`clbench.docsite`) into the site."""

import mkdocs_gen_files

from clbench.docsite import pages, results

for path, text in pages().items():
    with mkdocs_gen_files.open(path, "w") as page:
        page.write(text)
for path, source in results.files().items():
    with mkdocs_gen_files.open(path, "wb") as image:
        image.write(source.read_bytes())
