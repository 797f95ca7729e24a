// SPDX-License-Identifier: Apache-2.0

package main

import (
	"strings"
)

// suggest returns the known key closest to key, for "did you mean": one that differs
// only in case, or within an edit distance of about a third of its length (at least
// 1, at most 3); "" when none is that close.
func suggest(key string, known []string) string {
	best, bestD := "", 1<<30
	for _, k := range known {
		if strings.EqualFold(k, key) {
			return k
		}
		d := distance(strings.ToLower(key), strings.ToLower(k))
		if d < bestD {
			best, bestD = k, d
		}
	}
	limit := min(3, max(1, len(key)/3))
	if bestD <= limit {
		return best
	}
	return ""
}

// distance is the Damerau-Levenshtein distance (optimal string alignment) of a and
// b: insertions, deletions, substitutions and adjacent transpositions each cost 1.
func distance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	d := make([][]int, len(ra)+1)
	for i := range d {
		d[i] = make([]int, len(rb)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(ra); i++ {
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && ra[i-1] == rb[j-2] && ra[i-2] == rb[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(ra)][len(rb)]
}
