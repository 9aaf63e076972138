import sys

from sglang_pcie.cli import main

sys.exit(main())
