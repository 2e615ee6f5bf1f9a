"""PySpark jobs that index wire logs by message id and find known error cases.

Empty until the Spark issue.
"""
