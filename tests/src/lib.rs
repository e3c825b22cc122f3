//! Harness for black-box tests: starts real `floret` processes.
