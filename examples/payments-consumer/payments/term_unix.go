//go:build unix

package payments

import (
	"os"

	"golang.org/x/sys/unix"
)

// termWidth is the width of the terminal f, or 80 when it cannot tell.
func termWidth(f *os.File) int {
	ws, err := unix.IoctlGetWinsize(int(f.Fd()), unix.TIOCGWINSZ)
	if err != nil || ws.Col == 0 {
		return 80
	}
	return int(ws.Col)
}
