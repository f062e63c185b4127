"""Count how often a letter occurs in a word, one letter at a time.

Usage: python count_letters.py WORD LETTER
"""

import sys


def count(word: str, letter: str) -> int:
    """Go through the word one letter at a time and count the matches."""
    return sum(1 for ch in word.lower() if ch == letter.lower())


if __name__ == "__main__":
    print(count(sys.argv[1], sys.argv[2]))
