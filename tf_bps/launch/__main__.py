import sys

from tf_bps.launch.bpslaunch import main

sys.exit(main())
