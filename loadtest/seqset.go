package loadtest

import "math/bits"

// maxSeqSpan bounds how far apart the seqs of one seqSet may lie: a bit
// per seq between the lowest and the highest, so at most 8 MiB per set.
// The seqs of one dialog in one measurement are dense (one per event).
const maxSeqSpan = 1 << 26

// seqSet is a set of positive seqs of one dialog, a bitset over
// [base, base+64·len(words)). The zero value is empty.
type seqSet struct {
	base  int64 // a multiple of 64
	words []uint64
	n     int // seqs in the set
}

// add inserts seq; it reports false when seq is not positive or lies more
// than maxSeqSpan from the set's other seqs (it is then not stored).
func (s *seqSet) add(seq int64) bool {
	if seq <= 0 {
		return false
	}
	w := seq &^ 63
	if s.words == nil {
		s.base, s.words = w, make([]uint64, 1, 16)
	}
	end := s.base + 64*int64(len(s.words))
	switch {
	case w < s.base:
		if end-w > maxSeqSpan {
			return false
		}
		grown := make([]uint64, (end-w)/64, (end-w)/64+16)
		copy(grown[(s.base-w)/64:], s.words)
		s.base, s.words = w, grown
	case w >= end:
		if w+64-s.base > maxSeqSpan {
			return false
		}
		for range (w - end) / 64 {
			s.words = append(s.words, 0)
		}
		s.words = append(s.words, 0)
	}
	i, bit := (seq-s.base)/64, uint64(1)<<(seq&63)
	if s.words[i]&bit == 0 {
		s.words[i] |= bit
		s.n++
	}
	return true
}

// common counts the seqs in both s and o.
func (s *seqSet) common(o *seqSet) int {
	lo, hi := max(s.base, o.base), min(s.base+64*int64(len(s.words)), o.base+64*int64(len(o.words)))
	n := 0
	for w := lo; w < hi; w += 64 {
		n += bits.OnesCount64(s.words[(w-s.base)/64] & o.words[(w-o.base)/64])
	}
	return n
}
