//go:build !unix

package payments

import "os"

// termWidth is 80: the width of a terminal is read on Unix only.
func termWidth(*os.File) int { return 80 }
