"""What a reader sees: the report JSON and its rows (:mod:`.report`), the one formatting path of tables
(:mod:`.format`), orderings against measured noise (:mod:`.stats`), whether a headline run learned (:mod:`.status`),
the summary card (:mod:`.card`), ``reports/index.html`` (:mod:`.index`), the README's results table
(:mod:`.readme`), the notebooks' plots (:mod:`.plots`) and parameters check (:mod:`.notebook_params`), and a
headless look at the HTML (:mod:`.browser`).
"""
