package control

import "testing"

// TestEpochIndex: the index Load builds gives every offset the epoch a
// scan of the re-drives gives.
func TestEpochIndex(t *testing.T) {
	s := State{Redrives: []Redrive{
		{Topic: "p", Epoch: 1, Parts: []Part{{Partition: 0, Start: 100, End: 200}, {Partition: 1, Start: 0, End: 50}}},
		{Topic: "p", Epoch: 3, Parts: []Part{{Partition: 0, Start: 150, End: 300}}},
		{Topic: "p", Epoch: 2, Parts: []Part{{Partition: 0, Start: 120, End: 400}}},
		{Topic: "q", Epoch: 4, Parts: []Part{{Partition: 0, Start: 0, End: 10}}},
	}}
	indexed := s
	indexed.index()
	for _, topic := range []string{"p", "q", "r"} {
		for part := int32(0); part < 3; part++ {
			for off := int64(-1); off < 450; off++ {
				if a, b := s.Epoch(topic, part, off), indexed.Epoch(topic, part, off); a != b {
					t.Fatalf("Epoch(%s, %d, %d): scan %d, index %d", topic, part, off, a, b)
				}
			}
		}
	}
	if e := indexed.Epoch("p", 0, 160); e != 3 {
		t.Errorf("Epoch(p, 0, 160) = %d, want 3", e)
	}
}
