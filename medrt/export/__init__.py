"""DICOM SEG, SR and SC objects built with highdicom, and atomic writers."""
