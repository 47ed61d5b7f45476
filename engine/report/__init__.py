"""`kf report`: a search's evidence as one self-contained HTML page.

- gather.py: the report's contents, read from the search's event log (model.py holds their shape);
- lessons_delta.py: the lessons the search started with and what it added, by the projection's own fold;
- plots.py: the figures, matplotlib rendered to SVG;
- page.py: the HTML page, every piece of logged text escaped.
"""

from engine.report.gather import gather_report
from engine.report.page import comparison_page, search_page

__all__ = ["comparison_page", "gather_report", "search_page"]
