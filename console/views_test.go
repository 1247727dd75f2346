package console

import "testing"

func TestShowBytes(t *testing.T) {
	for in, want := range map[string]string{
		"plain":                     "plain",
		"a\xffb":                    `a\xffb`,
		"tab\tnl\n":                 "tab\tnl\n",
		"bell\x07":                  `bell\x07`,
		"rtl\u202eoverride":         `rtl\u202eoverride`,
		"<script>alert(1)</script>": "<script>alert(1)</script>",
	} {
		if got := showBytes([]byte(in)); got != want {
			t.Errorf("showBytes(%q) = %q, want %q", in, got, want)
		}
	}
}
